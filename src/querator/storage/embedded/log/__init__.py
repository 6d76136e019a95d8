"""Storage layer: engine v3's claim log over one transaction's rows, shared by the embedded stores
(``store.ClaimLogEngine``), a module per role of the port (``querator.ports.log``): ``items``,
``leasing``, ``upkeep``; ``codec`` encodes items in rows, ``base`` holds the rows and what the roles
share.
"""
