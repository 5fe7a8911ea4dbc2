"""Machine-readable documents of hookbus's interfaces: the bus as AsyncAPI, the gateway as
OpenAPI."""
