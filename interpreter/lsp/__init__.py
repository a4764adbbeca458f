"""The `.clock` language server (`dsl lsp`): diagnostics, hover with plan numbers, go to definition."""
