"""Runbooks: the YAML files (the built-in ones are beside this module), their model, their run
and their report."""
