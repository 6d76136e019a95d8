"""One construct per concern; the stack only composes them."""
