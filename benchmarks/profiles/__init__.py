"""The committed model profiles and the script that adds flags to them."""
