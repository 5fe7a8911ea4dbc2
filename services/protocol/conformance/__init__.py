"""The conformance kit: `hookbus conformance -- COMMAND` checks a worker against the protocol."""
