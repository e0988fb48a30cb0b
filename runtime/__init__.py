"""The heterogeneous runtime: plain Python and torch, never Django.

The control plane calls into this package with dataclasses and gets dataclasses back;
nothing here knows about tenants, databases or HTTP frameworks.
"""
