"""``python -m services.plain_consumer``: the plain consumer's command line (``consumer.main``)."""

from services.plain_consumer.consumer import main

raise SystemExit(main())
