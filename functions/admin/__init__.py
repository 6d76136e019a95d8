"""Lambda function package (its asset is this folder)."""
