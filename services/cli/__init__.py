"""The `hookbus` command line (`main`) and the commands that live only there: `run`, `chat`,
`monitor`, `status`, `health`."""
