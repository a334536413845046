"""Device and topology math: where a process group's ranks sit and what bandwidth it gets."""
