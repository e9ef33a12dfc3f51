"""The canary job: judge a model version's canary track against its stable track during a bake."""
