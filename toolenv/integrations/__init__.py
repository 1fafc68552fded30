"""Bridges from toolenv to training frameworks; each lives in its own subpackage.

A subpackage imports its framework (e.g. verl) only inside itself, so the core
never pays for or depends on it.
"""
