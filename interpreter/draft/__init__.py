"""Drafting a `.clock` file from a stock streaming loop: run it, watch what persists, propose regions."""
