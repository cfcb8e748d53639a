"""Generated from proto/ by ``python -m tools.codegen``: do not edit."""
