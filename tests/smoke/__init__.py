"""The cluster smoke suite (checks/) and its verification against a stand-in GPU cluster."""
