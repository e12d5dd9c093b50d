"""Pure defenses over parameter pytrees, plus privacy accounting and bounds."""
