"""Model adapters by route."""
