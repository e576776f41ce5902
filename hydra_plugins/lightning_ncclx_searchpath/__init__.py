"""Hydra search-path plugin of lightning-ncclx (see lightning_ncclx_searchpath.py). Hydra imports
every module under ``hydra_plugins``; there is deliberately no ``hydra_plugins/__init__.py``."""
