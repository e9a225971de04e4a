"""`oddl plan`: a collective's plan and schedule from the command line, as text and as a picture."""
