"""Storage adapters: the only code that speaks to a database."""
