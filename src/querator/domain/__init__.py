"""Domain layer: pure values, validation rules and lifecycle decisions (standard library only)."""
