"""Helpers shared by the tests (and only by them): servers, fleets, fake children."""
