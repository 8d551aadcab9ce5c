"""A run's samples over time: what the node program ``sampler`` (:mod:`clusterddp.node.sampler`) kept on each
node, read back (:mod:`.samples`), made into series and stragglers (:mod:`.series`), shown on the terminal and
exported (:mod:`.render`: `clusterddp metrics`), and drawn in one HTML file (:mod:`.report`: `clusterddp report`).
"""
