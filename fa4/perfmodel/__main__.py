"""`python -m fa4.perfmodel`: see cli.py."""

from .cli import main

main()
