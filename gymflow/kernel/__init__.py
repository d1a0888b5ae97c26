"""The ground layer: wire types, config, errors, store. Imports nothing above it."""
