"""The browser pages: server-rendered views over the services and selectors, htmx partials for their live parts.

Each page has a module of thin views; what a page computes lives in the services (webapp.services) and the planner,
as for the REST API, so that a page and an API answer never disagree.
"""
