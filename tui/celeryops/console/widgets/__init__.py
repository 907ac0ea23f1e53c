"""Small reusable widgets of the console."""
