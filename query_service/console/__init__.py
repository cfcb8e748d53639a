"""The web console: pages for operators on the query service's HTTP port.

Server-rendered HTML (jinja2) with htmx for the parts that refresh and uPlot for the
charts, both vendored under ``static/vendor`` with their licences and checksums: the
pages fetch nothing from anywhere but the service. Every read and action goes through
the same servicer methods, authorization and metrics as gRPC and HTTP/JSON
(``query_service.console.calls``); a login session stands in for the bearer token.
"""
