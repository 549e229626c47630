from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination

from .parsers import MAX_INT


class Pagination(PageNumberPagination):
    """Pages of 50 by default; ``page_size`` a 64-bit integer from 1 up, more than 1,000 reads as 1,000. A
    ``page_size`` that is not one such integer is refused as the schema says, not silently replaced by the default."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 1000

    def get_page_size(self, request):
        given = request.query_params.getlist(self.page_size_query_param)
        if not given:
            return self.page_size
        if len(given) > 1 or not given[0].isascii() or not given[0].isdigit() or not 1 <= int(given[0]) <= MAX_INT:
            raise ValidationError({self.page_size_query_param: [
                f"{', '.join(map(repr, given))}: give one whole number of items per page, from 1 "
                f"(more than {self.max_page_size} reads as {self.max_page_size})"]})
        return min(int(given[0]), self.max_page_size)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"]["minimum"] = 1
        return parameters
