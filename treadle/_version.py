"""treadle's version, in one place: the package, its metadata (pyproject.toml) and what a run
records (env.txt, each checkpoint's strategy entry) read it here, without importing the package."""

__version__ = "0.1.0"
