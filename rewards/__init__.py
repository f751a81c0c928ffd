"""Pure reward functions and the parsing they share (answer extraction, choice letters)."""
