"""Generated from proto/ by ``python -m query_service.codegen``: do not edit."""
