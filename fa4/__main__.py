"""`python -m fa4`: prints what this installation compiled."""

from .build_info import summary

print(summary())
