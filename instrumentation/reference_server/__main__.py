"""``python -m infersight.instrumentation.reference_server --port N`` (binds 127.0.0.1 unless told)."""

from __future__ import annotations

import argparse
import logging

from infersight.instrumentation import Instrumentation


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m infersight.instrumentation.reference_server",
                                     description=__doc__)
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--backend", default="aot_eager",
                        help="torch.compile backend: aot_eager (default; fast to compile on CPU), eager, "
                             "inductor (needs a C++ compiler; ~30 s to compile on 2 cores), or none")
    parser.add_argument("--seed", type=int, default=0, help="weights seed")
    parser.add_argument("--model-name", default="infersight-tiny")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    import uvicorn

    from infersight.instrumentation.reference_server.engine import Engine
    from infersight.instrumentation.reference_server.server import create_app
    from infersight.instrumentation.torch_compile import TorchCompileInstrumentor

    instrumentor = TorchCompileInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:  # opentelemetry-instrument may have done it
        instrumentor.instrument()
    inst = Instrumentation(engine="torch.compile", provider_name="infersight-reference",
                           operation="text_completion")
    engine = Engine(inst, backend=args.backend, seed=args.seed, model_name=args.model_name)
    try:
        uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level="warning")
    finally:
        engine.close()


if __name__ == "__main__":
    main()
