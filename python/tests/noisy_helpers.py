"""A module that prints to stdout while it loads (as some libraries do)."""

print("hello from noisy_helpers, on stdout", flush=True)


def work(payload):
    print("and more while running", flush=True)
    return payload[::-1]
