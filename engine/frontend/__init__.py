"""Wire formats only: the v2 codecs and the HTTP and gRPC servers. The only package that knows a transport."""
