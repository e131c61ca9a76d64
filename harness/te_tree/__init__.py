"""TransformerEngine source trees, read without torch: a tree validated and identified
(``tree``: commit, dirty state, digest, version), the names its Python takes from the
compiled extension and the enums its headers declare (``scan``, which te-cpu's stand-in
follows), and the project's own fix as a patch (``patches/``, applied by ``patch-te``).
"""
