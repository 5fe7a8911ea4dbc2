"""The `hookbus` command line (placeholder until the services land)."""


def main() -> None:
    print("hookbus")
