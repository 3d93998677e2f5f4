"""Stands in for a missing driver: first on PYTHONPATH, it fails to import as a missing one does."""

raise ModuleNotFoundError("No module named 'MySQLdb'", name="MySQLdb")
