"""The command line: parses, calls one library function, renders. No logic lives here."""
