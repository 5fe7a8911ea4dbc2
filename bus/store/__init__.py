"""State kept in Redis: the request journal, session data, stored Responses API responses,
each request's response stream to its client, and the monitor's event stream."""
