"""The pool service."""
