"""``MMLogger.get_current_instance()`` is treadle's logger (parent of ``treadle.optim.*``)."""

import logging


class MMLogger:
    """Only the class method the optimizer tests call."""

    @staticmethod
    def get_current_instance() -> logging.Logger:
        """treadle's logger."""
        return logging.getLogger("treadle")
