"""Lambda entry points: one package per function, each a few lines over ``querator``."""
