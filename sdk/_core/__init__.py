"""The sans-IO core: events, chain rules, codecs and protocol state machines.

Nothing in this package imports trio, reads a clock or touches the network
or a store: time and replies come in as arguments, decisions go out as values.
"""
