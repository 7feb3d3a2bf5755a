"""Examples of bringing your own model to Ferret (docs/your-model.md)."""
