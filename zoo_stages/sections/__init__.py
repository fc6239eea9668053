"""The recipe-wide sections zoo's kinds share (`model:`, `data:`, `task:`), one module each.

Registered as `zoo.sections` entry points in pyproject.toml, as a plugin registers its own (the
contract: `zoo/section.py`); the recipe parser imports them to validate every recipe, so they stay
light: pydantic and the standard library at module level.
"""
