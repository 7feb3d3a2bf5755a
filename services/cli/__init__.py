"""The ``ferret`` command line."""
