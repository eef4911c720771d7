"""The inference engine core: no Django imports anywhere below this package."""
