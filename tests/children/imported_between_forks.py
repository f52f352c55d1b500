"""Imported by tests/test_registry.py between two worker forks of one loader start; defines nothing."""
