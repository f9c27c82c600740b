"""Convert time: what turns a transpiled model into a package (the manifest, the CUDA graph choice, the side-by-side
search for a kernel that disagrees). It may import the transpiler and the emitters; the runtime never imports it."""
