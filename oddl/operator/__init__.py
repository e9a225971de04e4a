"""The operator's views of a running controller: the API client and its tables, `oddl watch`,
and `oddl devices probe`."""
