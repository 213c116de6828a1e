from steerflow import NodeCall


def count_words(call: NodeCall) -> str:
    return str(len(call.results["write"].split()))
