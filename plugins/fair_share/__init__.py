"""Fair share by tokens (`--scheduling fair`): the Virtual Token Counter as a waiting queue of the built-in scheduler."""
