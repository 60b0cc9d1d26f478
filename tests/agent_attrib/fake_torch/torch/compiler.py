_compiling = [False]


def is_dynamo_compiling():
    return _compiling[0]


is_compiling = is_dynamo_compiling
