"""`commtag summary`: what it reads (inputs), the tables and figure it writes (tables, sections)."""
