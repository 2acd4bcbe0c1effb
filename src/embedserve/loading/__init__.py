"""Reading a model folder: its spec, the family registry, the bundled model, Hub ids. No torch."""
