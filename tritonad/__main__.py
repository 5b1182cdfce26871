"""`python -m tritonad ...`: see tritonad/cli.py."""
from .cli import main

main()
