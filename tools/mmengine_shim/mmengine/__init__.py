"""A stand-in ``mmengine`` package that maps the names MMEngine's optimizer and
scheduler unit tests import onto treadle (see ``tools/mmengine_shim/README.md``).

It is not MMEngine and holds none of its code: each name is either treadle's own
object under MMEngine's name, or the smallest helper the tests need to import.
"""

__version__ = "0.10.7+treadle-shim"
